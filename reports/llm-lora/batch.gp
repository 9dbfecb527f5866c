# vramlab report: gnuplot batch.gp in this folder re-renders batch.png
if (!exists("vl_png")) vl_png = 'batch.png'
set terminal png size 900,480 noenhanced
set output vl_png
set title 'Peak memory vs batch at sequence 512 (rung after, planned)'
set xlabel 'micro-batch'
set ylabel 'GB'
set grid
plot 'batch.dat' using 1:2 with linespoints lw 2 title 'peak', 23.7082 with lines lw 2 lc rgb 'red' title 'cap'
