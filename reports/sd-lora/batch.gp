# vramlab report: gnuplot batch.gp in this folder re-renders batch.png
if (!exists("vl_png")) vl_png = 'batch.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Peak memory vs batch (rung after, planned at 512x512)'
set xlabel 'micro-batch'
set ylabel 'GB'
set grid
set key left top
plot 'batch.dat' using 1:2 with linespoints lw 2 pt 7 title 'planned peak', 22.6774 with lines lw 2 lc rgb 'red' title 'cap, 24 GB card', 45.3549 with lines lw 2 dt 2 lc rgb 'red' title 'cap, 48 GB card'
