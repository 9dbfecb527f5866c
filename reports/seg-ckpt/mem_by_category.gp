set terminal png size 1000,560 noenhanced
set output 'mem_by_category.png'
set title 'Peak memory by category per rung (planned, 512x512, batch as configured)'
set style data histograms
set style histogram rowstacked
set style fill solid 0.85 border -1
set boxwidth 0.7
set ylabel 'GB'
set key outside right
set xtics rotate by -30
set yrange [0:*]
array col[9] = ['#7b3294', '#1b9e77', '#80b1d3', '#e6ab02', '#f0e442', '#377eb8', '#e41a1c', '#333333', '#a65628']
plot for [i=3:11] 'mem_by_category.dat' using i:xtic(2) title columnheader(i) lc rgb col[i-2], '' using 1:12 with linespoints lw 2 pt 7 lc rgb 'red' title 'cap'
